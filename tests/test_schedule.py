"""jaxfit schedule --dry-run: real probes of scripts/train.py on the CPU, the plan, and bad input."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import REPO, error_line

from jaxfit.errors import ConfigError
from jaxfit.schedule import packing
from jaxfit.schedule.planner import equal_share, resolve_gpus
from jaxfit.schedule.queue_file import parse_queue

pytestmark = pytest.mark.slow  # real subprocesses and compiles

TRAIN = str(REPO / "scripts" / "train.py")
GiB, MiB = 1 << 30, 1 << 20
FAST = ["--max-batch", "2", "--quiet"]  # batches 1 and 2 only: one compile round per fit


def _absolute(command):
    """The queue's command with `python` and `scripts/train.py` made absolute (runs from any folder)."""
    args = shlex.split(command) if isinstance(command, str) else list(command)
    return [sys.executable if a == "python" else TRAIN if a == "scripts/train.py" else a for a in args]


def _debug_queue(folder: Path, name: str = "queue.yaml", top: dict | None = None, **changes) -> Path:
    """configs/queue-debug.yaml with absolute commands; ``top``: top-level keys to set; ``changes``
    maps experiment -> keys to set."""
    data = yaml.safe_load((REPO / "configs" / "queue-debug.yaml").read_text())
    data.update(top or {})
    for experiment in data["experiments"]:
        experiment["command"] = _absolute(experiment["command"])
        experiment.update(changes.get(experiment["name"], {}))
    path = folder / name
    path.write_text(yaml.safe_dump(data))
    return path


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300):
    return subprocess.run(
        [sys.executable, "-m", "jaxfit.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=dict(os.environ, **(env or {})),
        timeout=timeout,
    )


def _repo_checkpoints() -> set[str]:
    folder = REPO / "checkpoints"
    return {str(p) for p in folder.rglob("*")} if folder.exists() else set()


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One compile cache for the probing tests, so the second plan reuses the first one's compiles."""
    return {"JAXFIT_CACHE_DIR": str(tmp_path_factory.mktemp("schedule-cache")), "JAX_PLATFORMS": "cpu"}


@pytest.fixture(scope="module")
def debug_folder(tmp_path_factory) -> Path:
    """The temporary folder of the debug queue's dry run (:func:`one_gpu_plan`) and real run."""
    return tmp_path_factory.mktemp("schedule-one")


@pytest.fixture(scope="module")
def one_gpu_plan(debug_folder, shared_cache):
    """`jaxfit schedule <debug queue> --dry-run --json out.json` run once, from a temporary folder."""
    cwd = debug_folder
    before = _repo_checkpoints()
    queue = _debug_queue(cwd)
    proc = _cli("schedule", str(queue), "--dry-run", "--json", "out.json", *FAST, cwd=cwd, env=shared_cache)
    assert proc.returncode == 0, proc.stderr
    assert _repo_checkpoints() == before  # the probes ran in the temporary folder
    return proc, json.loads((cwd / "out.json").read_text())


def _check_capacity(plan: dict) -> None:
    """At no start does a GPU hold more than its capacity live (the runs it waits for are gone)."""
    by_name = {p["name"]: p for p in plan["placements"]}
    for gpu in plan["gpus"]:
        assert gpu["planned_bytes"] <= gpu["capacity_bytes"]
        placed = [p for p in plan["placements"] if p["gpu"] == gpu["index"]]
        for p in placed:
            live = [q for q in placed if q["start"] <= p["start"] and q["name"] not in p["after"]]
            assert sum(q["need_bytes"] for q in live) <= gpu["capacity_bytes"], (gpu, p)
        assert all(by_name[name]["gpu"] == gpu["index"] for name in gpu["runs"])


def test_dry_run_plans_every_experiment(one_gpu_plan):
    proc, data = one_gpu_plan
    runs = {run["name"]: run for run in data["runs"]}
    names = ["debug-gpt-auto", "debug-gpt-fixed", "debug-vit-batch", "debug-vit-accum"]
    assert sorted(runs) == sorted(names)
    for name in names:
        assert name in proc.stdout
        run = runs[name]
        assert run["batch_size"] >= 1 and 0 < run["mem_fraction"] <= 1
        assert f"--batch-size={run['batch_size']}" in run["command"]
    # fixed batch and fraction: kept as given, nothing fitted
    fixed = runs["debug-gpt-fixed"]
    assert (fixed["batch_size"], fixed["mem_fraction"], fixed["fitted"], fixed["peak_bytes"]) == (16, 0.1, False, None)
    assert fixed["priority"] == 1 and data["plan"]["placements"][0]["name"] == "debug-gpt-fixed"
    # fixed batch: the smallest fraction that holds it
    vit_batch = runs["debug-vit-batch"]
    assert vit_batch["batch_size"] == 16 and vit_batch["fitted"] and vit_batch["peak_bytes"] > 0
    assert vit_batch["peak_bytes"] <= vit_batch["mem_fraction"] * 1 * GiB
    # fixed fraction: the largest batch (capped at 2 here) is the micro-batch; the run trains at the
    # global batch 32 in 16 accumulation steps, and that accumulated step was compiled to prove it fits
    accum = runs["debug-vit-accum"]
    assert (accum["mem_fraction"], accum["batch_size"], accum["grad_accum_steps"]) == (0.05, 32, 16)
    assert accum["command"][-2:] == ["--batch-size=32", "--grad-accum-steps=16"]
    assert accum["fitted"] and accum["peak_bytes"] > 0
    # both auto: the equal share of 1 GPU among 4 runs, floor((1 GiB - 64 MiB) / 4 / 1 GiB) = 0.23
    auto = runs["debug-gpt-auto"]
    assert auto["mem_fraction"] == 0.23 and auto["fitted"] and auto["peak_bytes"] > 0
    plan = data["plan"]
    assert {p["name"] for p in plan["placements"]} == set(names)
    assert plan["reserve_bytes"] == 64 * MiB and len(plan["gpus"]) == 1
    assert plan["gpus"][0]["capacity_bytes"] == 1 * GiB - 64 * MiB
    _check_capacity(plan)
    assert "GPU 0:" in proc.stdout and "capacity" in proc.stdout


def test_two_logical_gpus_spread_the_runs(debug_folder, shared_cache, one_gpu_plan):
    # gpt-fixed at 0.6 leaves no room next to it for gpt-auto's share (0.46: 2 runs per GPU).
    # The file says 8 GiB; --device-memory 1GiB overrides it. (1 GiB and the dry run's folder: the
    # vit runs ask what the dry run asked, and their fits are its answers; gpt-auto's share is new.)
    queue = _debug_queue(debug_folder, "two.yaml", {"device_memory": "8GiB"}, **{"debug-gpt-fixed": {"fraction": 0.6}})
    before = _repo_checkpoints()
    proc = _cli(
        "schedule",
        str(queue),
        "--dry-run",
        "--gpus",
        "2",
        "--device-memory",
        "1GiB",
        "--json",
        "two.json",
        *FAST,
        cwd=debug_folder,
        env=shared_cache,
    )
    assert proc.returncode == 0, proc.stderr
    assert _repo_checkpoints() == before
    data = json.loads((debug_folder / "two.json").read_text())
    plan = data["plan"]
    assert [g["index"] for g in plan["gpus"]] == [0, 1]
    assert all(g["runs"] for g in plan["gpus"])  # both GPUs get runs
    assert plan["waves"] == 1
    _check_capacity(plan)
    runs = {run["name"]: run for run in data["runs"]}
    assert runs["debug-gpt-auto"]["mem_fraction"] == 0.46  # floor((1 GiB - 64 MiB) / 2 / 1 GiB), not of 8 GiB (0.49)
    assert plan["placements"][0]["gpu"] != next(p["gpu"] for p in plan["placements"] if p["name"] == "debug-gpt-auto")
    assert "GPU 1:" in proc.stdout


def _small_queue(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "q.yaml"
    path.write_text(text)
    return path


def test_the_debug_queue_runs_to_the_end(debug_folder, shared_cache, one_gpu_plan):
    """configs/queue-debug.yaml for real, after its dry run in the same folder (:func:`one_gpu_plan`),
    as a user runs it: the plan the dry run showed, from the answers its probes left in the cache,
    then four scripts/train.py runs, all done. (A real schedule that probes is
    test_a_two_gpu_run_next_to_single_gpu_runs.)"""
    queue = _debug_queue(debug_folder)
    proc = _cli(
        "schedule",
        str(queue),
        *FAST,
        "--json",
        "result.json",
        "--monitor-interval",
        "0.5",
        cwd=debug_folder,
        env={**shared_cache, "WANDB_MODE": "disabled"},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    data = json.loads((debug_folder / "result.json").read_text())
    rows = {row["name"]: row for row in data["experiments"]}
    assert {name: row["state"] for name, row in rows.items()} == dict.fromkeys(
        ["debug-gpt-auto", "debug-gpt-fixed", "debug-vit-batch", "debug-vit-accum"], "done"
    )
    planned = {run["name"]: run for run in one_gpu_plan[1]["runs"]}
    for name, row in rows.items():  # the dry run's plan is what ran
        assert (row["batch_size"], row["grad_accum_steps"], row["mem_fraction"]) == (
            planned[name]["batch_size"],
            planned[name]["grad_accum_steps"],
            planned[name]["mem_fraction"],
        ), (row, planned[name])
    assert rows["debug-vit-accum"]["batch_size"] == 32 and rows["debug-vit-accum"]["grad_accum_steps"] == 16
    for row in rows.values():
        log = Path(row["log_path"]).read_text()
        assert f"batch {row['batch_size']}" in log or f"batch_size={row['batch_size']}" in log, log[-1500:]
    assert Path(data["timeline"]).read_bytes()[:4] == b"\x89PNG"


def test_a_missing_queue_file_is_one_line(tmp_path):
    line = error_line(_cli("schedule", "nope.yaml", "--dry-run", cwd=tmp_path))
    assert "cannot read queue file 'nope.yaml'" in line


def test_a_run_too_big_for_the_gpu_is_rejected_with_its_need(tmp_path):
    queue = _small_queue(
        tmp_path,
        f"""
device_memory: 8GiB
reserve: 1GiB
process_overhead: 0
experiments:
  - name: huge
    command: [{sys.executable}, {TRAIN}, debug, --exp-name=huge]
    batch: 16
    fraction: 1.0
""",
    )
    line = error_line(_cli("schedule", str(queue), "--dry-run", cwd=tmp_path))
    assert "run 'huge' needs 8.00 GiB" in line and "7.00 GiB" in line


@pytest.mark.parametrize("flags", [[], ["--gpus", "2"]])
def test_no_gpu_and_no_size_asks_for_gpus_and_device_memory(tmp_path, flags):
    queue = _small_queue(
        tmp_path,
        f"""
experiments:
  - name: a
    command: [{sys.executable}, {TRAIN}, debug, --exp-name=a]
    batch: 8
    fraction: 0.5
""",
    )
    line = error_line(_cli("schedule", str(queue), "--dry-run", *flags, cwd=tmp_path, env={"CUDA_VISIBLE_DEVICES": ""}))
    assert "pass --gpus N --device-memory SIZE" in line


def test_a_queue_of_given_settings_plans_without_probing(tmp_path):
    queue = _small_queue(
        tmp_path,
        """
device_memory: 8GiB
experiments:
  - {name: a, command: ['false', --exp-name=a], batch: 8, fraction: 0.5}
  - {name: b, command: ['false', --exp-name=b], batch: 8, fraction: 0.5, global_batch: 32}
  - {name: c, command: ['false', --exp-name=c], batch: 8, fraction: 0.5}
""",
    )
    proc = _cli("schedule", str(queue), "--dry-run", "--json", "p.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "p.json").read_text())
    assert [r["grad_accum_steps"] for r in data["runs"]] == [1, 4, 1]
    assert data["plan"]["waves"] == 2  # two halves fit at once; the third waits
    _check_capacity(data["plan"])


def test_equal_share_and_gpu_selection():
    assert equal_share(8 * GiB, 4, 256 * MiB, 0) == 0.24
    assert equal_share(8 * GiB, 2, 256 * MiB, 0) == 0.48
    assert equal_share(80 * GiB, 3, 0, 618 * MiB) == 0.32
    with pytest.raises(ConfigError, match="less than 1%"):
        equal_share(8 * GiB, 200, 0, 0)
    queue = parse_queue({"gpus": [1], "experiments": [{"name": "a", "command": "x"}]}, "q.yaml")
    visible = [packing.GPU(0, 80 * GiB), packing.GPU(1, 40 * GiB)]
    assert resolve_gpus(queue, detected=visible) == [packing.GPU(1, 40 * GiB)]
    assert resolve_gpus(queue, gpus=2, detected=visible) == visible
    assert resolve_gpus(queue, gpus=3, device_memory_bytes=GiB, detected=[]) == [packing.GPU(i, GiB) for i in range(3)]
    with pytest.raises(ConfigError, match="--gpus 3 asks for 3 GPUs but 2 are visible"):
        resolve_gpus(queue, gpus=3, detected=visible)
    with pytest.raises(ConfigError, match="pass --gpus N --device-memory SIZE"):
        resolve_gpus(queue, detected=[])


def test_a_global_batch_below_the_fitted_batch_is_compiled_not_assumed(tmp_path, shared_cache):
    """The fitted micro-batch (2) is larger than the global batch (1): the run trains at 1 without
    accumulation, and batch 1 itself is compiled under the fraction (peaks need not grow with the
    batch), not assumed to fit."""
    queue = _small_queue(
        tmp_path,
        f"""
device_memory: 1GiB
process_overhead: 0
experiments:
  - name: small-global
    command: {json.dumps(_absolute("python scripts/train.py debug_vit --exp-name=small-global --overwrite"))}
    fraction: 0.05
    global_batch: 1
""",
    )
    proc = _cli(
        "schedule", str(queue), "--dry-run", "--json", "p.json", "--max-batch", "2", cwd=tmp_path, env=shared_cache
    )
    assert proc.returncode == 0, proc.stderr
    assert "small-global: global batch 1 as 1 x 1" in proc.stdout + proc.stderr  # compiled at 1
    (run,) = json.loads((tmp_path / "p.json").read_text())["runs"]
    assert (run["batch_size"], run["grad_accum_steps"], run["mem_fraction"]) == (1, 1, 0.05)
    assert run["command"][-1] == "--batch-size=1" and not any("--grad-accum-steps" in a for a in run["command"])
    assert run["fitted"] and 0 < run["peak_bytes"] <= 0.05 * GiB


def test_a_two_gpu_run_next_to_single_gpu_runs(tmp_path, shared_cache):
    """``gpus: 2``: scripts/train.py --fsdp-devices=2 on two logical GPUs (host devices), planned on
    both beside two single-GPU runs, run for real to the end; a third GPU asked for is refused."""
    two_devices = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2", "WANDB_MODE": "disabled"}
    experiments = [
        {
            "name": "sharded",
            "command": [
                *_absolute("python scripts/train.py debug"),
                "--exp-name=sharded",
                "--fsdp-devices=2",
                "--fsdp-min-bytes=1",
                "--num-train-steps=4",
                "--overwrite",
            ],
            "gpus": 2,
            "fraction": 0.3,
            "env": two_devices,
        },
    ] + [
        {
            "name": f"single-{i}",
            "command": [
                *_absolute("python scripts/train.py debug"),
                f"--exp-name=single-{i}",
                "--num-train-steps=4",
                "--overwrite",
            ],
            "batch": 8,
            "fraction": 0.3,
            "env": {"WANDB_MODE": "disabled"},
        }
        for i in range(2)
    ]
    queue = tmp_path / "q.yaml"
    queue.write_text(yaml.safe_dump({"reserve": 0, "process_overhead": 0, "experiments": experiments}))
    proc = _cli(
        "schedule", str(queue), "--gpus", "2", "--device-memory", "1GiB", "--json", "result.json",
        "--monitor-interval", "0.5", *FAST, f"--probe-arg=--checkpoint-base-dir={tmp_path / 'probe'}",
        cwd=tmp_path, env=shared_cache, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr + proc.stdout
    data = json.loads((tmp_path / "result.json").read_text())
    rows = {row["name"]: row for row in data["experiments"]}
    assert rows["sharded"]["gpus"] == [0, 1]
    assert [len(rows[f"single-{i}"]["gpus"]) for i in range(2)] == [1, 1]
    assert "0,1" in proc.stdout  # the status table shows it on both GPUs
    assert {name: row["state"] for name, row in rows.items()} == dict.fromkeys(rows, "done")
    assert rows["sharded"]["batch_size"] % 2 == 0  # fitted over the script's two devices
    log = Path(rows["sharded"]["log_path"]).read_text()
    assert "devices=2 (cpu) fsdp_devices=2" in log
    assert Path(data["timeline"]).read_bytes()[:4] == b"\x89PNG"

    experiments[0]["gpus"] = 3
    queue.write_text(yaml.safe_dump({"reserve": 0, "process_overhead": 0, "experiments": experiments}))
    refused = _cli("schedule", str(queue), "--gpus", "2", "--device-memory", "1GiB", "--dry-run", cwd=tmp_path)
    assert "experiment 'sharded' takes gpus: 3 but the plan has 2 GPUs" in error_line(refused)
    assert "round" not in refused.stderr  # refused before any fit


@pytest.mark.parametrize(
    "limit,said,left",
    [
        (16384, "cannot create the schedule state", False),  # the state file itself cannot be made
        (65536, "cannot create the schedule state in", False),  # the plan cannot be stored
        (131072, "the runs were stopped; free space, then rerun with --resume", True),  # a run's start
    ],
)
def test_a_state_disk_that_takes_no_more_is_one_line(tmp_path, limit, said, left):
    """RLIMIT_FSIZE makes writes past ``limit`` bytes fail as on a full disk: one line, exit 2, no
    run left running, and a state made by this call that holds nothing is not left behind."""
    import resource

    queue = tmp_path / "q.yaml"
    mini = tmp_path / "mini_train.py"  # its own copy: a run of another test's is no leftover of this one
    shutil.copy(REPO / "tests" / "fixtures" / "mini_train.py", mini)
    queue.write_text(
        "gpus: 1\ndevice_memory: 1GiB\nprocess_overhead: 0\nexperiments:\n"
        f"  - name: a\n    command: [{sys.executable}, {mini}, --steps, '2']\n    batch: 8\n    fraction: 0.1\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "jaxfit.cli", "schedule", str(queue), "--state-dir", str(tmp_path / "runs"), "--quiet"],
        capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
    )  # fmt: skip
    assert proc.returncode == 2 and said in error_line(proc), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert (tmp_path / "runs").exists() == left
    alive = subprocess.run(["pgrep", "-f", str(mini)], capture_output=True, text=True).stdout.split()
    assert not alive, "a run outlived the schedule"


def test_a_dry_run_refuses_a_program_that_does_not_exist_as_the_real_run_does(tmp_path):
    queue = tmp_path / "q.yaml"
    queue.write_text(
        "gpus: 1\ndevice_memory: 1GiB\nexperiments:\n"
        "  - name: a\n    command: [nosuchprog, x.py]\n    batch: 8\n    fraction: 0.1\n"
    )
    for extra in (["--dry-run"], []):
        proc = subprocess.run(
            [sys.executable, "-m", "jaxfit.cli", "schedule", str(queue), "--state-dir", str(tmp_path / "r"), *extra],
            capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=120,
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        assert error_line(proc) == "jaxfit: error: experiment 'a': command not found: 'nosuchprog' is not on PATH"
