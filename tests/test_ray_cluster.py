"""The Ray backend on a real Ray cluster of three nodes on this machine: the head (no GPU; the
scheduler's node) and two worker nodes with one logical GPU each and their own temporary folders
(TMPDIR), so every run lands on another node than the scheduler's. Nothing may assume a shared disk: what a run reads travels with
it through Ray (the pin's folder, its settings, jaxfit's start-up hook) and what it writes comes
back (its log, status and pin report). A worker node that dies takes its run with it: the attempt
is lost (the scheduler runs it again elsewhere) and its command does not outlive it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import yaml
from helpers import wait_for_code
from test_execute import FAKE, _env, _fake, _queue

from jaxfit.fit.command import PROBE_DIR
from jaxfit.schedule.backends.local import LaunchSpec, read_status
from jaxfit.schedule.backends.ray import OWNER_NAMESPACE, RAY_LOST, WRONG_GPU, RayLauncher, owner_name

pytestmark = pytest.mark.slow  # real Ray daemons and subprocesses

ray = pytest.importorskip("ray")

MARK = "JAXFIT_TEST_RAY_CLUSTER"
"""Set in the environment of every process of the cluster, to find them all at the end."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _marked(mark: str) -> set[int]:
    """Processes started with ``MARK=mark``, and every descendant of theirs (Ray's agents rename
    themselves over their environment)."""
    parents: dict[int, int] = {}
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if stat[0] == "Z":
                continue
            parents[int(entry.name)] = int(stat[1])
            if f"{MARK}={mark}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                found.add(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    grew = True
    while grew:
        children = {pid for pid, ppid in parents.items() if ppid in found} - found
        found |= children
        grew = bool(children)
    return found


@pytest.fixture(scope="module")
def cluster():
    """``ray start --head`` (no GPU) and ``ray start --address`` of two nodes with one logical GPU
    and a TMPDIR each; a launcher connected to it. Every process of the cluster is gone at the end."""
    ray_cli = str(Path(sys.executable).parent / "ray")
    mark = uuid.uuid4().hex
    head_tmp = tempfile.mkdtemp(prefix="rh", dir="/tmp")  # short: Ray's socket paths are limited
    node_tmps = [tempfile.mkdtemp(prefix="rn", dir="/tmp") for _ in range(2)]
    smi = Path(head_tmp) / "bin" / "nvidia-smi"  # the nodes' GPUs say they have 24 GiB
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 24576\n")
    smi.chmod(0o755)
    port = _free_port()
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED")}
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")  # the driver too (conftest)
    env = dict(os.environ, **{MARK: mark})
    common = ["--num-cpus=1", "--disable-usage-stats"]  # the machine's own address, as a driver takes it
    launcher = None
    try:
        head = subprocess.run(
            [ray_cli, "start", "--head", f"--port={port}", "--num-gpus=0", "--include-dashboard=false",
             f"--temp-dir={head_tmp}", *common],
            env=env, check=True, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        found = re.search(r"ray start --address='([^']+)'", head.stdout + head.stderr)
        address = found.group(1) if found else f"127.0.0.1:{port}"
        for node_tmp in node_tmps:
            subprocess.run(
                [ray_cli, "start", f"--address={address}", "--num-gpus=1", *common],
                env=dict(env, TMPDIR=node_tmp, PATH=f"{smi.parent}{os.pathsep}{env['PATH']}"),
                check=True, capture_output=True, timeout=180,
            )  # fmt: skip
        launcher = RayLauncher(address=address)
        yield {
            "launcher": launcher,
            "address": address,
            "node_tmps": [Path(t) for t in node_tmps],
            "mark": mark,
        }
    finally:
        if launcher is not None:
            launcher.close()
        for pid in _marked(mark):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        deadline = time.monotonic() + 10
        while _marked(mark) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _marked(mark)
        for folder in (head_tmp, *node_tmps):
            shutil.rmtree(folder, ignore_errors=True)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        assert not left, f"processes of the cluster outlived it: {sorted(left)}"


SEES = """
import json, os, sys
pin = os.environ["JAXFIT_PIN"]
seen = {
    "pin": pin,
    "pin_json": open(pin).read(),
    "executable": open(os.path.join(os.path.dirname(pin), "executable.bin"), "rb").read().hex(),
    "settings": open(os.environ["JAXFIT_WANDB_CONFIG"]).read(),
    "hook": [p for p in os.environ["PYTHONPATH"].split(os.pathsep) if os.path.isfile(os.path.join(p, "sitecustomize.py"))],
    "cwd": os.getcwd(),
    "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
}
with open(os.environ["JAXFIT_PIN_REPORT"], "w") as f:
    json.dump({"program_pinned": True, "from": "the other node"}, f)
print("SEEN " + json.dumps(seen))
print("to stderr", file=sys.stderr)
"""


def test_a_run_on_another_node_takes_its_files_along_and_brings_its_outputs_back(cluster, tmp_path):
    pin = tmp_path / "pins" / "abc"
    pin.mkdir(parents=True)
    (pin / "pin.json").write_text('{"step_name": "train_step"}')
    (pin / "executable.bin").write_bytes(bytes(range(256)) * 4)
    settings = tmp_path / "logs" / "run.1.settings.json"
    settings.parent.mkdir()
    settings.write_text('{"batch_size": 8}')
    spec = LaunchSpec(
        name="far",
        attempt=1,
        command=(sys.executable, "-c", SEES),
        env={
            "JAXFIT_PIN": str(pin / "pin.json"),
            "JAXFIT_PIN_REPORT": str(tmp_path / "logs" / "run.1.pin.json"),
            "JAXFIT_WANDB_CONFIG": str(settings),
            "PYTHONPATH": PROBE_DIR,
        },
        log_path=str(tmp_path / "logs" / "run.1.log"),
        status_path=str(tmp_path / "logs" / "run.1.status.json"),
        gpu=0,
        gpu_share=0.5,
        cwd=str(tmp_path / "not-on-that-node"),
    )
    handle = cluster["launcher"].start(spec)
    assert wait_for_code(handle) == 0
    log = Path(spec.log_path).read_text()
    seen = json.loads(next(line for line in log.splitlines() if line.startswith("SEEN "))[5:])
    node_tmp = next(str(t) for t in cluster["node_tmps"] if seen["pin"].startswith(str(t)))  # a copy there
    assert seen["pin_json"] == '{"step_name": "train_step"}'
    assert bytes.fromhex(seen["executable"]) == bytes(range(256)) * 4
    assert seen["settings"] == '{"batch_size": 8}'
    assert len(seen["hook"]) == 1 and seen["hook"][0].startswith(node_tmp)
    assert seen["cwd"].startswith(node_tmp)  # the scheduler's folder is not there
    assert seen["cuda"] == "0"  # the node's one GPU
    assert "to stderr" in log and "this attempt ran on Ray node" in log
    assert read_status(spec.status_path) == 0
    assert json.loads(Path(spec.env["JAXFIT_PIN_REPORT"]).read_text())["from"] == "the other node"
    assert handle.pid is None  # its runner ran on the other node
    assert not list(Path(node_tmp).glob("jaxfit-run-*"))  # the node keeps nothing


def _two_runs_nodes(cluster: dict, tmp_path: Path, fraction: float) -> dict[str, str]:
    """Schedule runs a and b of ``fraction`` of a GPU on the cluster: the node each ran on."""
    out = {"FAKE_TRAIN_OUT": str(tmp_path / "out"), "WANDB_MODE": "disabled"}  # the scheduler's own do not travel
    _queue(tmp_path, [_fake(n, "--sleep=4", fraction=fraction, env=out) for n in ("a", "b")], gpus=2)
    proc = subprocess.run(
        [sys.executable, "-m", "jaxfit.cli", "schedule", "queue.yaml", "--gpus", "2", "--device-memory", "8GiB",
         "--grace", "2", "--monitor-interval", "0.2", "--quiet", "--backend", "ray", "--ray-address",
         cluster["address"], "--json", "result.json"],
        cwd=tmp_path, capture_output=True, text=True, env=_env(tmp_path / "out"), timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    result = {e["name"]: e for e in json.loads((tmp_path / "result.json").read_text())["experiments"]}
    assert {n: r["state"] for n, r in result.items()} == {"a": "done", "b": "done"}
    logs = {n: (tmp_path / "jaxfit-runs" / "queue" / "logs" / f"{n}.1.log").read_text() for n in "ab"}
    nodes = {n: re.search(r"ran on Ray node (\w+)", log) for n, log in logs.items()}
    assert all(nodes.values()), logs
    for n, m in nodes.items():  # the result says where each attempt ran, as its log does
        assert m is not None and f"(node {m.group(1)[:12]})" in result[n]["host"], result[n]
        assert result[n]["hosts"] == [result[n]["host"]]
    return {n: m.group(1) for n, m in nodes.items() if m}


def test_a_queue_is_placed_across_the_nodes(cluster, tmp_path):
    """``jaxfit schedule --backend ray --ray-address``: two runs of 0.6 of a GPU each cannot share a
    node's one GPU, so Ray places one on each node; both finish, with their logs in the state folder."""
    nodes = _two_runs_nodes(cluster, tmp_path, 0.6)
    assert nodes["a"] != nodes["b"]  # one run on each node


def test_small_runs_are_spread_over_the_clusters_gpus_not_packed_onto_one(cluster, tmp_path):
    """Two runs of 0.1 of a GPU: Ray alone packs fractional requests (on four H100s four such runs
    shared one GPU while its neighbour idled, benchmarks/JOURNAL.md section 14); each now asks Ray
    for an even split of the free GPUs (here a whole one), so they run on the two nodes' GPUs."""
    nodes = _two_runs_nodes(cluster, tmp_path, 0.1)
    assert nodes["a"] != nodes["b"], nodes  # one on each node's GPU


def test_a_run_planned_for_another_gpu_size_is_not_started_on_this_one(cluster, tmp_path):
    """Its fraction is a share of the GPU it was planned for: on a node whose GPU (24 GiB, by its
    nvidia-smi) is not that size, it is refused with one line in its log and exit code 78."""

    def spec(name: str, planned: int) -> LaunchSpec:
        return LaunchSpec(
            name=name,
            attempt=1,
            command=(sys.executable, "-c", "print('trained')"),
            env={},
            log_path=str(tmp_path / f"{name}.log"),
            status_path=str(tmp_path / f"{name}.status.json"),
            gpu=0,
            gpu_share=0.5,
            cwd=str(tmp_path),
            gpu_total_bytes=planned,
        )

    wrong = spec("wrong", 80 << 30)
    assert wait_for_code(cluster["launcher"].start(wrong)) == WRONG_GPU
    log = Path(wrong.log_path).read_text()
    assert "trained" not in log
    assert "Ray gave it GPU 0 of 24.0 GiB, and it was planned for a GPU of 80.0 GiB" in log
    right = spec("right", (24 << 30) - (144 << 20))  # CUDA's total of a GPU is a little below nvidia-smi's
    assert wait_for_code(cluster["launcher"].start(right)) == 0
    assert "trained" in Path(right.log_path).read_text()


def _join(cluster: dict, node_tmp: str) -> None:
    """``ray start --address`` of one more worker node with one logical GPU and its own TMPDIR,
    marked as the cluster's so that the fixture stops it too."""
    subprocess.run(
        [str(Path(sys.executable).parent / "ray"), "start", f"--address={cluster['address']}", "--num-gpus=1",
         "--num-cpus=1", "--disable-usage-stats"],
        env=dict(os.environ, TMPDIR=node_tmp, **{MARK: cluster["mark"]}),
        check=True, capture_output=True, timeout=180,
    )  # fmt: skip


def _process_with(needle: bytes, timeout: float = 90) -> Path | None:
    """The /proc entry of the live fake training command whose arguments hold ``needle`` (not the
    runner or guard that start it, whose command lines hold its arguments too: the guard's first
    process exits as soon as it has forked)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if (
                    entry.name.isdigit()
                    and len(argv) > 2
                    and argv[1] == str(FAKE).encode()
                    and needle in argv
                    and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
                ):
                    return entry
            except OSError:
                continue
        time.sleep(0.2)
    return None


def test_resume_adopts_the_runs_a_dead_scheduler_left_on_the_cluster(cluster, tmp_path):
    """SIGKILL to `jaxfit schedule` mid-run: on a cluster its run belongs to the schedule's owner
    actor, not to the dead driver, so it goes on; `--resume` (the cluster's address kept in the
    state) adopts it: one attempt, finished, nothing run twice; the owner actor is gone at the end."""
    out = {"FAKE_TRAIN_OUT": str(tmp_path / "out"), "WANDB_MODE": "disabled"}
    _queue(tmp_path, [_fake("kept", "--sleep=12", fraction=0.6, env=out, retries=0)], gpus=2)
    schedule = subprocess.Popen(
        [sys.executable, "-m", "jaxfit.cli", "schedule", "queue.yaml", "--gpus", "2", "--device-memory", "8GiB",
         "--grace", "2", "--monitor-interval", "0.2", "--quiet", "--backend", "ray", "--ray-address",
         cluster["address"]],
        cwd=tmp_path, env=_env(tmp_path / "out"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        command = _process_with(b"--exp-name=kept")
        assert command is not None, "the run never started"
        schedule.kill()
    finally:
        schedule.kill()
        schedule.wait()
    time.sleep(3)
    assert (command / "cmdline").exists(), "the run died with the scheduler"
    resumed = subprocess.run(
        [sys.executable, "-m", "jaxfit.cli", "schedule", "queue.yaml", "--resume", "--grace", "2",
         "--monitor-interval", "0.2", "--json", "result.json"],
        cwd=tmp_path, env=_env(tmp_path / "out"), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "adopted" in resumed.stdout
    run = json.loads((tmp_path / "result.json").read_text())["experiments"][0]
    assert (run["state"], run["attempts"]) == ("done", 1)
    assert "this attempt ran on Ray node" in Path(run["log_path"]).read_text()
    assert not (tmp_path / "jaxfit-runs" / "queue" / "logs" / "kept.2.log").exists()
    with pytest.raises(ValueError):
        ray.get_actor(owner_name(str(tmp_path / "jaxfit-runs" / "queue")), namespace=OWNER_NAMESPACE)


def test_a_worker_node_that_dies_loses_its_run_and_leaves_no_command(cluster, tmp_path):
    """SIGKILL to the worker node's raylet mid-run: the task fails (RAY_LOST: the scheduler starts
    the run again where GPUs remain) and the guard stops the command with its worker."""
    marker = f"jaxfit-doomed-{uuid.uuid4().hex}"
    spec = LaunchSpec(
        name="doomed",
        attempt=1,
        command=(sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)", marker),
        env={},
        log_path=str(tmp_path / "doomed.log"),
        status_path=str(tmp_path / "doomed.status.json"),
        gpu=0,
        gpu_share=0.5,
        cwd=str(tmp_path),
    )
    handle = cluster["launcher"].start(spec)

    def commands() -> list[int]:
        out = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if marker.encode() in (entry / "cmdline").read_bytes():
                        stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                        if stat[0] != "Z":
                            out.append(int(entry.name))
                except OSError:
                    pass
        return out

    deadline = time.monotonic() + 60
    while not commands() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert commands(), "the command never started on the worker node"
    cluster_pids = _marked(cluster["mark"])
    raylets = [
        pid for pid in cluster_pids if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"raylet")
    ]
    command_env = Path(f"/proc/{commands()[0]}/environ").read_bytes().split(b"\0")
    node_env = next(e for e in command_env if e.startswith(b"TMPDIR="))  # the node it runs on
    worker = [pid for pid in raylets if node_env in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")]
    assert len(worker) == 1, raylets
    os.kill(worker[0], signal.SIGKILL)
    assert wait_for_code(handle, timeout=90) == RAY_LOST
    deadline = time.monotonic() + 30
    while commands() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not commands(), "the command outlived its node"


def test_a_schedule_starts_a_run_lost_with_its_node_again_without_spending_a_retry(cluster, tmp_path):
    """A node joins; the run lands on one of the two worker nodes, and that node dies mid-run. The
    run has no retries (`retries: 0`), so only a loss that spends none lets it finish: on the node
    that remains, with the lost attempt's log saying what happened (its node brought nothing back)."""
    joined = tempfile.mkdtemp(prefix="rn", dir="/tmp")
    try:
        _join(cluster, joined)
        out = {"FAKE_TRAIN_OUT": str(tmp_path / "out"), "WANDB_MODE": "disabled"}
        _queue(tmp_path, [_fake("far", "--sleep=10", fraction=0.6, env=out, retries=0)], gpus=2)
        schedule = subprocess.Popen(
            [sys.executable, "-m", "jaxfit.cli", "schedule", "queue.yaml", "--gpus", "2", "--device-memory", "8GiB",
             "--grace", "2", "--monitor-interval", "0.2", "--quiet", "--backend", "ray", "--ray-address",
             cluster["address"], "--json", "result.json"],
            cwd=tmp_path, env=_env(tmp_path / "out"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            command = _process_with(b"--exp-name=far")
            assert command is not None, "the run never started"
            node_env = next(e for e in (command / "environ").read_bytes().split(b"\0") if e.startswith(b"TMPDIR="))
            raylets = [
                pid
                for pid in _marked(cluster["mark"])
                if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"raylet")
                and node_env in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            ]
            assert len(raylets) == 1
            os.kill(raylets[0], signal.SIGKILL)
            output, _ = schedule.communicate(timeout=150)
        finally:
            if schedule.poll() is None:
                schedule.kill()
                schedule.wait()
        assert schedule.returncode == 0, output
        run = json.loads((tmp_path / "result.json").read_text())["experiments"][0]
        assert (run["state"], run["attempts"], run["crashes"]) == ("done", 2, 0)
        # where each attempt ran, the lost one too (its task said where it started, before its node died)
        assert len(run["hosts"]) == 2 and all(run["hosts"]) and run["hosts"][0] != run["hosts"][1], run["hosts"]
        logs = sorted(Path(run["log_path"]).parent.glob("far.*.log"))
        assert [p.name for p in logs] == ["far.1.log", "far.2.log"]
        assert "lost with its Ray worker or node" in logs[0].read_text()
        assert "this attempt ran on Ray node" in logs[1].read_text()
    finally:
        shutil.rmtree(joined, ignore_errors=True)


def _settled_gpus(timeout: float = 90) -> int:
    """The cluster's GPUs once the count of its live nodes has held still for 5 s (a node killed by
    an earlier test is declared dead only after Ray misses its heartbeats)."""
    seen, since, deadline = None, time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = sum(n["Resources"].get("GPU", 0) for n in ray.nodes() if n["Alive"])
        if now != seen:
            seen, since = now, time.monotonic()
        elif time.monotonic() - since >= 5:
            return int(now)
        time.sleep(0.5)
    raise AssertionError(f"the cluster's GPUs did not settle: {seen}")


def test_a_node_that_joins_mid_queue_gets_work(cluster, tmp_path):
    """The plan is for one GPU, and the cluster has G worker GPUs: G + 1 runs of 0.6 of a GPU run G
    at a time (two do not share a GPU). A node with a GPU joins while the first ones are going: the
    scheduler counts the cluster's GPUs, not the plan's, so the last run starts there before the
    first ones end."""
    gpus = _settled_gpus()
    names = [f"run-{i}" for i in range(gpus + 1)]
    out = {"FAKE_TRAIN_OUT": str(tmp_path / "out"), "WANDB_MODE": "disabled"}
    _queue(tmp_path, [_fake(n, "--sleep=20", fraction=0.6, env=out) for n in names])
    schedule = subprocess.Popen(
        [sys.executable, "-m", "jaxfit.cli", "schedule", "queue.yaml", "--gpus", "1", "--device-memory", "8GiB",
         "--grace", "2", "--monitor-interval", "0.2", "--backend", "ray", "--ray-address", cluster["address"],
         "--json", "result.json"],
        cwd=tmp_path, env=_env(tmp_path / "out"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    joined = tempfile.mkdtemp(prefix="rn", dir="/tmp")
    try:
        assert _process_with(b"--exp-name=run-0") is not None, "the first run never started"
        _join(cluster, joined)
        output, _ = schedule.communicate(timeout=300)
    finally:
        if schedule.poll() is None:
            schedule.kill()
            schedule.wait()
        shutil.rmtree(joined, ignore_errors=True)
    assert schedule.returncode == 0, output
    runs = {e["name"]: e for e in json.loads((tmp_path / "result.json").read_text())["experiments"]}
    assert all(r["state"] == "done" for r in runs.values()), runs
    first_end = min(r["ended_at"] for r in runs.values())
    assert max(r["started_at"] for r in runs.values()) < first_end, "the joined node got no work"
    assert "on the Ray cluster" in output


def test_a_queue_is_planned_on_a_node_of_the_cluster(cluster, tmp_path):
    """``--plan-on-cluster``: the dry run that probes and fits the queue runs as a Ray task on a
    worker node (the scheduler's node here has no GPU), and the plan and its proven program come
    back: the run trains pinned to the program the node's fit proved."""
    train = str(Path(__file__).resolve().parents[1] / "scripts" / "train.py")
    queue = {
        "reserve": 0,
        "process_overhead": 0,
        "experiments": [
            {
                "name": "planned-far",
                "command": [sys.executable, train, "debug", "--exp-name=planned-far", "--num-train-steps=2",
                            "--overwrite", f"--checkpoint-base-dir={tmp_path / 'ck'}"],
                "batch": 4,
                "fraction": "auto",
                "env": {"WANDB_MODE": "disabled"},
            }
        ],
    }  # fmt: skip
    (tmp_path / "queue.yaml").write_text(yaml.safe_dump(queue))
    plans_before = set(Path(tempfile.gettempdir()).glob("jaxfit-cluster-plan-*"))
    proc = subprocess.run(
        [sys.executable, "-m", "jaxfit.cli", "schedule", "queue.yaml", "--gpus", "1", "--device-memory", "4GiB",
         "--grace", "2", "--monitor-interval", "0.2", "--backend", "ray", "--ray-address", cluster["address"],
         "--plan-on-cluster", "--json", "result.json", f"--probe-arg=--checkpoint-base-dir={tmp_path / 'probe'}"],
        cwd=tmp_path, capture_output=True, text=True, env=_env(tmp_path / "out"), timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    planned_on = re.search(r"planned on \S+ \(Ray node (\w+)\)", proc.stdout)
    assert planned_on, proc.stdout[-2000:]
    workers = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")]
    assert any(w.startswith(planned_on.group(1)) for w in workers)  # not the scheduler's node
    run = json.loads((tmp_path / "result.json").read_text())["experiments"][0]
    assert run["state"] == "done" and run["program_pinned"] is True and 0 < run["mem_fraction"] < 1
    assert (
        set(Path(tempfile.gettempdir()).glob("jaxfit-cluster-plan-*")) <= plans_before
    )  # its pins were copied, then removed
